"""The results on disk: the append-only segment store of result rows (`store`) and the readers' index of
its segments (`segment_index`)."""
