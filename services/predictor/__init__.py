"""Output-length predictor (ALISE §3.1): prompt embedding, Qdrant top-k retrieval with a
similarity threshold, MLP fallback, and online learning from completion records."""
from services.predictor.config import PredictorConfig
from services.predictor.types import Completion, ObserveResult, Prediction, Source

__all__ = ["Completion", "ObserveResult", "Prediction", "PredictorConfig", "Source"]
