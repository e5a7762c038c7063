"""The results on disk: the append-only segment store of result rows (`store`), the readers' index of its
segments (`segment_index`) and the export of one row per item and step (`export`)."""
