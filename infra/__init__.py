"""Deployment files (launcher YAMLs, KubeRay manifests, images) and their offline checks: infra/validate.py."""
