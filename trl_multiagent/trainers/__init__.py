from .magrpo import MultiAgentGRPOConfig, MultiAgentGRPOTrainer

__all__ = ["MultiAgentGRPOConfig", "MultiAgentGRPOTrainer"]
