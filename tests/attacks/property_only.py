"""Round two, class 7: code that satisfies the properties a chapter teaches without doing the work.

Weights that never look at q or k can still sum to one, be zero where the mask says so and
never look ahead. A property check pays only when the function also computes the right
values, so these earn only what their honest parts deserve: the reference masks (parts 4
and 5 of exercise 03), nothing for the attention parts.
"""

from __future__ import annotations

from conftest import add_cell, reference_notebook

KEY = "03_qkv"

# Every query spreads its weight evenly over the keys it may attend to.
UNIFORM = '''
def softmax(x, axis=-1):
    return np.ones_like(x) / x.shape[axis]
def attention_numpy(q, k, v, mask=None):
    allowed = np.ones(q.shape[:-1] + (k.shape[-2],)) if mask is None else np.broadcast_to(
        mask, q.shape[:-1] + (k.shape[-2],)).astype(float)
    w = allowed / np.maximum(allowed.sum(-1, keepdims=True), 1)
    return w @ v, w
def scaled_dot_product_attention(q, k, v, mask=None, dropout_p=0.0):
    allowed = torch.ones(q.shape[:-1] + (k.shape[-2],), dtype=q.dtype, device=q.device)
    if mask is not None:
        allowed = allowed * mask
    w = allowed / allowed.sum(-1, keepdim=True).clamp_min(1)
    return w @ v, w
'''

# All the weight on the first key each query may attend to.
FIRST_ALLOWED = '''
def softmax(x, axis=-1):
    out = np.zeros_like(x)
    np.put_along_axis(out, np.argmax(np.ones_like(x), axis=axis)[..., None] if axis in (-1, x.ndim - 1)
                      else np.expand_dims(np.argmax(np.ones_like(x), axis=axis), axis), 1.0, axis=axis)
    return out
def _first(allowed):
    first = (allowed.cumsum(-1) == 1) & allowed
    return first
def attention_numpy(q, k, v, mask=None):
    shape = q.shape[:-1] + (k.shape[-2],)
    allowed = np.ones(shape, dtype=bool) if mask is None else np.broadcast_to(mask, shape)
    w = _first(allowed).astype(q.dtype)
    return w @ v, w
def scaled_dot_product_attention(q, k, v, mask=None, dropout_p=0.0):
    shape = q.shape[:-1] + (k.shape[-2],)
    allowed = torch.ones(shape, dtype=torch.bool, device=q.device)
    if mask is not None:
        allowed = allowed & mask
    w = _first(allowed).to(q.dtype)
    return w @ v, w
'''

# The right computation on the wrong inputs: softmax(K K^T) instead of softmax(Q K^T).
KEYS_ONLY = '''
_sdpa = scaled_dot_product_attention
def scaled_dot_product_attention(q, k, v, mask=None, dropout_p=0.0):
    fake_q = k[..., :1, :].expand(q.shape).contiguous()
    return _sdpa(fake_q, k, v, mask, dropout_p)
'''


def build(ctx) -> None:
    ctx.nbs["property_uniform_weights"] = add_cell(reference_notebook(KEY), UNIFORM)
    ctx.nbs["property_first_allowed_key"] = add_cell(reference_notebook(KEY), FIRST_ALLOWED)
    ctx.nbs["property_ignores_queries"] = add_cell(reference_notebook(KEY), KEYS_ONLY)
