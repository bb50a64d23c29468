"""Configuration: YAML files -> validated frozen dataclasses."""

from raven.config.agent import AgentConfig, load_agent_config
from raven.config.gateway import AuthorisedAgent, GatewayConfig, load_gateway_config
from raven.config.loader import ConfigError

__all__ = [
    "AgentConfig",
    "AuthorisedAgent",
    "ConfigError",
    "GatewayConfig",
    "load_agent_config",
    "load_gateway_config",
]
