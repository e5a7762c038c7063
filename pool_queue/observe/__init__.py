"""Watching a screen: pool-status's view (`status`), each worker's snapshot in Redis (`presence`), vLLM's
prefix-cache hit rate (`prefix_cache`), the report's numbers and its Markdown (`report`, `markdown`) with
plots (`plots`), and the audit of a results root (`audit`)."""
