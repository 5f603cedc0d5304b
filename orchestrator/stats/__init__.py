"""Pure statistics: paired tests, power, alpha spending (used by report/, tune/, preflight/)."""
