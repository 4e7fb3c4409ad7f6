"""Units of work submitted to a Ray cluster: training and whole pipeline runs (`harnessrl.jobs`)."""
