"""Experiment tracking in MLflow (``logger=mlflow``): what a run records, and a client that never
holds training hostage (design §15). mlflow is imported only when a run uses it."""
