"""Put first on the e2e operator's PYTHONPATH: `import kubernetes` fails there as it does in the
operator image, which does not install the synchronous client (kopf then logs in and works through
kubernetes_asyncio alone)."""

raise ImportError("the kubernetes package is not in the operator image")
