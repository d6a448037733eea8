"""Code that runs on the serving hosts, copied there as this folder by `fab deploy`.

Standard library only, and nothing from outside this folder: a host has the
serving Python and nothing of ours installed (tests/test_layout.py checks it).

  layout             where things are on a host; the one HTTP helper
  background         a background process with a pid file and a log file
  tritonserver       lay out and run a real tritonserver (the nvidia-pytriton wheel)
  process_runtime    the process runtime's host commands (start, stop, status ...)
  container_runtime  the docker runtime's host commands (status, logs)
  image_build        the docker runtime's image build (wheelhouse, then docker build)
  facts              what the bench records of the host (CPU, GPUs, torch, Triton)
"""
