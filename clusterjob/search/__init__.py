"""A search (docs/design.md, "Search"), the whole feature in this package. What both sides
read of it: its record and folder (``record``), its study (``study``), the pruning rule
behind one call (``pruner``) and ASHA, its one rule (``asha``), and its trials as run
folders (``trials``). What drives it, a client of the executors above clusterjob.launch:
how each executor runs its slots (``slots``; on Slurm a job array, ``slurmarray``, whose
tasks run the slot driver, ``slotdriver``) and the commands on it (``commands``: submit,
status, cancel, resume)."""
