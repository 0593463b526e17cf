"""Training that outgrows one process: which rank this is, and one diagnosis for the job.

* :mod:`.process` - rank, world size and backend when ``torch.distributed`` is initialised;
* :mod:`.gather` - each rank's bounded summary sent to rank 0 at the end of a ``NeuralDbg`` block, with a
  timeout;
* :mod:`.merge` - the summaries merged into one diagnosis that says which ranks show each failure;
* :mod:`.job` - that diagnosis with the query API of one run (:class:`.job.JobRun`).

Sharded parameters (DDP, FSDP1, FSDP2) are read through :mod:`neuraldbg.model.shards`.
"""
