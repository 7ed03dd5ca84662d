"""Runners: where agents run. `local` starts them as process groups on this machine, `k8s` as Kubernetes Jobs."""
