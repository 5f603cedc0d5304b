"""The report's sections after the main tables (`extra` assembles them): effective batch, per task, the paired
design's trajectories, surprisal vs entropy (`decomposition`), sweeps, the `eval` command's results
(`offline_eval`) and what the model wrote (`examples`)."""
