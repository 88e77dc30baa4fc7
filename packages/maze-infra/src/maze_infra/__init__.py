"""Deploy mazerl on AWS: HyperPod clusters, SageMaker endpoints, Grafana dashboards as code."""

__version__ = "0.1.0"
