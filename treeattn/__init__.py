"""treeattn: plan, simulate and validate the cross-device merge of tree attention."""

__version__ = "0.1.0"
