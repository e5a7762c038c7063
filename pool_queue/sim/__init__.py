"""A simulated vLLM server for tests and the CPU demo: the model's answers (`model`), what a vLLM release
accepts (`dialects`, `checks`), its processor cache (`mmcache`), faults on request (`faults`), the HTTP server
(`server`) and its command line (`python -m pool_queue.sim`, `pool-sim`)."""
