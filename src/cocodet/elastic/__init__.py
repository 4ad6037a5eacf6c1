"""A run that outlives its processes under torchrun (design §7.4): one run folder that every node
and every restarted attempt agrees on (``run_folder``), the ranks of an attempt meeting on a store
of their own before Lightning joins them, rank 0's choice of the checkpoint to resume handed to
the others (``meeting``), and the attempts' ledger that counts restarts and the steps they redid
(``attempts``)."""
