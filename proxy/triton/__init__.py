"""In front of Triton (``--cancel-adapter triton``): HTTP generate carried over gRPC, so that a
hang-up is a cancelled call (:mod:`.bridge`); the generate extension's JSON as KServe v2 messages
(:mod:`.codec`); the models' metadata, read and kept (:mod:`.models`)."""
