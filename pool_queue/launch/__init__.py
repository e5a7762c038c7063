"""Starting the servers and their workers on one node: where servers go (`plan`), what each is started
with (`vllm`), how big a batch its GPU holds (`sizing`), bringing them up and keeping each server's workers
running until the queues are empty or a signal (`bringup`, `supervise`)."""
