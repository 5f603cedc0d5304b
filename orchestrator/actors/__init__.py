"""The actor floor: what every Ray actor of the project is built from (the model it loads, its engine settings,
where it runs), used by the trial's own actors (orchestrator/trial/actors/), the shared pool's
(orchestrator/pool/) and the offline evaluation's (orchestrator/evaluate/), so none of them imports another."""
