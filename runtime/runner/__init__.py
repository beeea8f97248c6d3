"""The one door to the forward pass: ``model_runner.ModelRunner`` owns the model, its KV and state pools
(``kv_pool``, ``state_pool``), the flat varlen batch (``forward_batch``), CUDA-graph decode
(``cuda_graph``) and the tensor-parallel ranks (``distributed``).  It never sees a request."""
