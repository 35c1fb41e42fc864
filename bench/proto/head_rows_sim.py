# Head-only simulation (docs/measurements/zen5-int4-head-rows-2026-12-07.md): the dense model's
# final-norm hidden states h, recovered from its logits through its Q8_0 head E (least squares),
# then the logits h @ Eq^T of quantized heads Eq, with and without some rows back at Q8_0;
# perplexity on `sparq eval`'s windows (16,384 tokens, ctx 512). The lookup keeps E, so this is
# the head's share of the cost alone.
# Usage (the release tree's module on PYTHONPATH, the .venv's gguf package):
#   python3 head_rows_sim.py MODEL.gguf wikitext-2-raw-test.txt CALIB.txt HEAD.sparq [...]
# where each HEAD.sparq comes from `sparq quantize MODEL --include NOTHING --embedding-values
# int4:gN --calib CALIB.txt` (only the head quantized).
import json, struct, sys, numpy as np, gguf, sparq
M = sys.argv[1]; W = sys.argv[2]; BOOK = sys.argv[3]; Q = sys.argv[4:]
r = gguf.GGUFReader(M)
t = [t for t in r.tensors if t.name == 'token_embd.weight'][0]
E = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(49152, 576)
def load_int4(path):
    f = open(path, 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n)); base = 8 + n
    def get(name, dt):
        a, b = h[name]['data_offsets']; f.seek(base + a)
        return np.frombuffer(f.read(b - a), dt).reshape(h[name]['shape'])
    v = get('token_embd.weight.values', np.uint8); s = get('token_embd.weight.scales', np.float16).astype(np.float32)
    codes = np.empty((v.shape[0], v.shape[1] * 2), np.float32); codes[:, 0::2] = v & 15; codes[:, 1::2] = v >> 4
    g = codes.shape[1] // s.shape[1]
    S = np.repeat(s, g, axis=1)
    if 'token_embd.weight.mins' in h:
        mn = np.repeat(get('token_embd.weight.mins', np.float16).astype(np.float32), g, axis=1)
        return (codes * S + mn).astype(np.float32)
    return ((codes - 8) * S).astype(np.float32)
heads = {q: load_int4(q) for q in Q}
m = sparq.load(M, gguf_values="f32")
toks = np.array(m.tokenize(open(W).read())[:16384])
book = np.array(m.tokenize(open(BOOK).read()))
freq = np.bincount(book, minlength=49152)
order = np.argsort(-freq, kind='stable')
cover = np.cumsum(freq[order]) / freq.sum()
Ginv = np.linalg.inv(E.astype(np.float64).T @ E.astype(np.float64))
variants = {'E (Q8_0, as stored)': E}
for q, Eq in heads.items():
    variants[q] = Eq
    for K in [1024, 2048, 4096, 8192]:
        Em = Eq.copy(); Em[order[:K]] = E[order[:K]]
        variants[f'{q} + top {K} book tokens Q8_0 (book coverage {cover[K-1]:.3f})'] = Em
        Ei = Eq.copy(); Ei[:K] = E[:K]
        variants[f'{q} + ids < {K} Q8_0 (book coverage {freq[:K].sum() / freq.sum():.3f})'] = Ei
nll = {k: 0.0 for k in variants}; cnt = 0; maxrec = 0.0
for w0 in range(0, 16384, 512):
    win = toks[w0:w0 + 512]
    L = m.logits(win.tolist()).astype(np.float64)
    h = (L @ E.astype(np.float64)) @ Ginv
    maxrec = max(maxrec, np.abs(h @ E.T.astype(np.float64) - L).max())
    h = h.astype(np.float32)
    tgt = win[1:]
    for k, Ev in variants.items():
        lg = (h[:-1] @ Ev.T).astype(np.float64)
        mx = lg.max(1, keepdims=True)
        lse = np.log(np.exp(lg - mx).sum(1)) + mx[:, 0]
        nll[k] += float((lse - lg[np.arange(len(tgt)), tgt]).sum())
    cnt += len(tgt)
print(f'predicted tokens {cnt}; max |h E^T - logits| {maxrec:.2e}')
base = np.exp(nll['E (Q8_0, as stored)'] / cnt)
for k in variants:
    p = np.exp(nll[k] / cnt); print(f'{p:9.4f}  {p / base - 1:+.4%}  {k}')
