//! The shapes measured: the model's (`--worker`'s encoding of them) and the same cut to a
//! memory and a time budget ([`Sizes`]).

/// The shapes measured: tokens of a micro-batch, sequence, width, heads, MLP width, vocabulary,
/// and the width of one head (`embd / heads`, or a llama's `head_dim`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Shapes {
    pub(super) tokens: usize,
    pub(super) seq: usize,
    pub(super) embd: usize,
    pub(super) heads: usize,
    pub(super) inter: usize,
    pub(super) vocab: usize,
    pub(super) head_dim: usize,
}

impl Shapes {
    pub(super) fn encode(&self) -> String {
        let s = self;
        format!(
            "{},{},{},{},{},{},{}",
            s.tokens, s.seq, s.embd, s.heads, s.inter, s.vocab, s.head_dim
        )
    }

    /// The width of the queries (and of the attention's output): `heads x head_dim`.
    pub(super) fn q_width(&self) -> usize {
        self.heads * self.head_dim
    }

    pub(super) fn decode(text: &str) -> Result<Shapes, String> {
        let v: Vec<usize> = text
            .split(',')
            .map(|x| x.trim().parse::<usize>())
            .collect::<Result<_, _>>()
            .map_err(|_| format!("--worker {text:?}: not seven whole numbers"))?;
        match v[..] {
            [tokens, seq, embd, heads, inter, vocab, head_dim]
                if v.iter().all(|&x| (1..=1 << 20).contains(&x))
                    && heads * head_dim <= 1 << 20
                    && tokens % seq == 0 =>
            {
                Ok(Shapes {
                    tokens,
                    seq,
                    embd,
                    heads,
                    inter,
                    vocab,
                    head_dim,
                })
            }
            _ => Err(format!("--worker {text:?}: not the shapes of a model")),
        }
    }
}

/// The most bytes one tensor measured has (f32), and at most a 48th of a rank's share of this
/// machine's available memory: the products, attention and kernels are measured at the model's
/// shapes cut to it (a rate in FLOP/s or bytes/s hardly depends on the size once it is this
/// large). GPT-2's output layer at 64 rows of 1024 tokens is 13.2 GB a tensor.
pub(super) const MAX_TENSOR_BYTES: f64 = (64 << 20) as f64;
/// The fewest tokens (rows of a product) and the narrowest width a cut keeps.
pub(super) const MIN_TOKENS: usize = 64;
pub(super) const MIN_WIDTH: usize = 256;

/// What is measured: the model's shapes cut so that every tensor stays within a memory budget
/// and every call within a time budget ([`Sizes::of`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Sizes {
    /// `(tokens, k, n)` of each product: a block's four (`C x 3q`, `q x C`, `C x I`, `I x C`,
    /// with `q` the queries' width, `C` but for a llama's `head_dim`) and the output layer's
    /// (`C x V`).
    pub(super) products: [(usize, usize, usize); 5],
    /// Attention's rows, heads, sequence and head size.
    pub(super) attention: (usize, usize, usize, usize),
    /// Tokens, width and MLP width of the memory-bound kernels.
    pub(super) kernels: (usize, usize, usize),
}

/// Halves `x` (rounding up) down to `floor` (or to what it is, if less).
fn halve(x: &mut usize, floor: usize) -> bool {
    let next = x.div_ceil(2).max(floor.min(*x));
    let changed = next < *x;
    *x = next;
    changed
}

impl Sizes {
    /// The model's shapes `s` with every f32 tensor at most `tensor_bytes`, each product call
    /// (forward and both backward products of the five) at most `call_flops` and attention's
    /// (forward and backward) at most half of it, and each kernel call at most `call_bytes`
    /// moved: tokens are cut first, then the widest dimensions (not below [`MIN_TOKENS`] and
    /// [`MIN_WIDTH`], or what the model has).
    pub(super) fn of(s: Shapes, tensor_bytes: f64, call_flops: f64, call_bytes: f64) -> Sizes {
        let (c, i, v, q) = (s.embd, s.inter, s.vocab, s.q_width());
        let mut products = [
            (s.tokens, c, 3 * q),
            (s.tokens, q, c),
            (s.tokens, c, i),
            (s.tokens, i, c),
            (s.tokens, c, v),
        ];
        for (m, k, n) in products.iter_mut() {
            // the weight within the budget (its widest side first), then the tokens
            while 4.0 * (*k * *n) as f64 > tensor_bytes {
                let widest = if *n >= *k { &mut *n } else { &mut *k };
                if !halve(widest, MIN_WIDTH) {
                    break;
                }
            }
            let most = (tensor_bytes / (4.0 * (*k).max(*n) as f64)) as usize;
            *m = (*m).min(most.max(1));
        }
        let flops = |p: &[(usize, usize, usize); 5]| p.iter().map(|&(m, k, n)| 6.0 * (m * k * n) as f64).sum::<f64>();
        while flops(&products) > call_flops {
            // fewer tokens for every product, else the widest dimension of all narrower
            let mut cut = false;
            for (m, _, _) in products.iter_mut() {
                cut |= halve(m, MIN_TOKENS);
            }
            if !cut {
                let widest = products
                    .iter_mut()
                    .flat_map(|(_, k, n)| [k, n])
                    .max_by_key(|d| **d)
                    .filter(|d| **d > MIN_WIDTH);
                match widest {
                    Some(d) => {
                        halve(d, MIN_WIDTH);
                    }
                    None => break,
                }
            }
        }
        // attention: q, k, v and their gradients `[rows, heads, seq, head size]`
        let head = s.head_dim;
        let (mut rows, mut heads, mut seq) = (s.tokens / s.seq, s.heads, s.seq);
        let cost = |rows: usize, heads: usize, seq: usize| {
            let bytes = 4.0 * (rows * heads * seq * head) as f64;
            let flops = 12.0 * (rows * seq * seq * heads * head) as f64;
            bytes > tensor_bytes || flops > call_flops / 2.0
        };
        while cost(rows, heads, seq) {
            if !(halve(&mut rows, 1) || halve(&mut heads, 1) || halve(&mut seq, MIN_TOKENS)) {
                break;
            }
        }
        // the kernels: `[tokens, C]` and `[tokens, I]`, read and written
        let mut tokens = s.tokens;
        while (4.0 * (tokens * c.max(i)) as f64 > tensor_bytes || 4.0 * (tokens * (5 * c + 2 * i)) as f64 > call_bytes)
            && halve(&mut tokens, MIN_TOKENS)
        {}
        Sizes {
            products,
            attention: (rows, heads, seq, head),
            kernels: (tokens, c, i),
        }
    }

    /// One line saying what was measured smaller than the model's shapes, if anything was.
    pub(super) fn cut(&self, s: &Shapes) -> Option<String> {
        let whole = Sizes::of(*s, f64::INFINITY, f64::INFINITY, f64::INFINITY);
        if *self == whole {
            return None;
        }
        let names = if s.q_width() == s.embd {
            ["C x 3C", "C x C", "C x I", "I x C", "output layer C x V"]
        } else {
            ["C x 3q", "q x C", "C x I", "I x C", "output layer C x V"]
        };
        let mut parts = Vec::new();
        for ((name, &(m, k, n)), &(m0, k0, n0)) in names.iter().zip(&self.products).zip(&whole.products) {
            if (m, k, n) != (m0, k0, n0) {
                parts.push(format!("{name} at {m} x {k} x {n} (of {m0} x {k0} x {n0})"));
            }
        }
        if self.attention != whole.attention {
            let (r, h, t, _) = self.attention;
            let (r0, h0, t0, _) = whole.attention;
            parts.push(format!(
                "attention at {r} rows x {h} heads x {t} tokens (of {r0} x {h0} x {t0})"
            ));
        }
        if self.kernels != whole.kernels {
            parts.push(format!(
                "the memory-bound kernels at {} tokens (of {})",
                self.kernels.0, whole.kernels.0
            ));
        }
        Some(parts.join(", "))
    }
}
