"""Run Triton model-serving experiments: provision -> deploy -> bench -> teardown.

The stages, each a module of this package:
  config        the project defaults (fabric.yaml), for code outside Fabric too
  gpus          how many GPUs a host has
  model_repo    render model_repository/ for one host (jinja2 templates, links resolved)
  smoke_weights real-architecture random weights, for hosts that cannot download any
  local_triton  install, start, wait for and stop a real tritonserver without Docker
"""
