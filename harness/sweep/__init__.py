"""What to run: a suite file parsed into plain-data Points, and shards of it."""
