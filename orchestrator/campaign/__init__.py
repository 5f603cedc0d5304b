"""A campaign: its schema, its sections and the pure expansion into trial configs."""
