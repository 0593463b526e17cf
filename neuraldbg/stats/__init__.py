"""Statistics: tensor reductions on the device (:mod:`.tensors`), one step's numbers on the host
(:mod:`.step`), and bounded series over a run (:mod:`.history`)."""
