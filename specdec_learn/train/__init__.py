"""Training learned drafters on the target's own text: prompts, data (or the corpus), features, then one file a method."""
