"""Run Triton model-serving experiments: provision -> deploy -> bench -> teardown.

The stages, each a module of this package:
  config        the lab settings in one order (defaults.yaml, user and project files, FABRIC_LAB_*), for every entry point
  gpus          how many GPUs a host has
  model_repo    render model_repository/ for one host (jinja2 templates, links resolved)
  smoke_weights real-architecture random weights, for hosts that cannot download any
  local_serving this machine's tritonserver: the rendered repository, install/start/stop

Code that runs on the serving hosts lives apart, in provision/host/ (standard
library only; the deploy copies that folder to every host): the tritonserver
process, the two runtimes' host commands, host facts, the image build, and
layout.py, which knows where things are on a host.
"""
