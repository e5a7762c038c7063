"""The inputs: the item table (`items`: loading, validating, the rows a screen may not take), the frame
folders (`frames`: the frame rule, 448-px JPEG encoding) and the tar shards they come in (`shards`)."""
