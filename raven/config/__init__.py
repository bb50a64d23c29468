"""Configuration: YAML files -> validated frozen dataclasses.

Import from the modules: raven.config.agent (AgentConfig, load_agent_config),
raven.config.gateway (GatewayConfig, AuthorisedAgent, load_gateway_config), raven.config.loader
(ConfigError). This package imports none of them, so an agent does not load the gateway's
config classes (issue 12)."""
