"""Choosing the next token: ``params.SamplingParams`` (what a request asks for), ``sampler.sample``
(greedy / temperature / top-k / top-p per row, in fp32), ``masking`` (grammar masks and ``logit_bias``
before it) and ``constrained`` (grammars compiled into per-token matchers, with llguidance)."""
