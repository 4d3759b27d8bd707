"""In front of Triton (``--cancel-adapter triton``): HTTP calls that run a model carried over
gRPC, so that a hang-up is a cancelled call (:mod:`.bridge`); the generate extension's JSON
(:mod:`.codec`) and ``/infer``'s JSON and binary tensors (:mod:`.infer`) as KServe v2 messages;
the models' metadata, read and kept (:mod:`.models`)."""
