"""Running a suite across processes and machines (ray, Slurm), and merging the shards."""
