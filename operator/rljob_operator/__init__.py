"""The rljob operator: reconciles RLTrainingJobs into KubeRay RayJobs."""
