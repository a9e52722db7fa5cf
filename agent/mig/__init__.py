#: NVML numbers GPUs 0..N-1; no node has more than this many. Here, not in spec.py, so the CLI's
#: GPU-index option (agent/cli/options.py) bounds its value without loading the parser.
MAX_GPU_INDEX = 255
