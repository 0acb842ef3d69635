"""Planning (both halves, standard library only): recipes, targets, formats, model shapes, memory, speed, the plan."""
