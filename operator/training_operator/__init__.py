"""Worker-side training operator: reconciles training-operator TrainJobs into JobSets and
validates TrainJobs in an admission webhook."""
