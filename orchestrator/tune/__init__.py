"""Ray Tune: the Tuner of a campaign, its scheduler and searcher (lockstep rounds, adaptive seeds)."""
