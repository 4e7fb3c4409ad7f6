"""MLflow models-from-code entry: the registered model is this file plus the critic folder.

MLflow loads this code (no pickled object) and the critic loads from safetensors + JSON,
so `mlflow.pyfunc.load_model("models:/NAME@ALIAS")` unpickles nothing.
"""

import mlflow
from mlflow.pyfunc import PythonModel


class CriticModel(PythonModel):
    def load_context(self, context):
        from harnessrl.critic import Critic

        self.critic = Critic.load(context.artifacts["critic"])

    def predict(self, context, model_input, params=None):
        """`model_input`: a DataFrame with `state` (text or object) and `candidates` (list of text)."""
        rows = model_input.to_dict(orient="records")
        return self.critic.score_batch([(r["state"], list(r["candidates"])) for r in rows])


mlflow.models.set_model(CriticModel())
