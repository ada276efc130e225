"""The health of running ranks, read on both sides (docs/design.md, "Hung and slow ranks"):
a rank's identity and its waits in collectives (``rankhealth``), its stacks asked for or
read from outside (``stackdump``, ``pyspy``), the stalls of a run (``stalls``) and its GPU
telemetry (``telemetry``). Above clusterjob.core, which holds no feature; stdlib only."""
