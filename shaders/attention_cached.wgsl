//#include "common.wgsl"
//#include "attention_cached_chunk.wgsl"
// CachedAttention (ir/ops/kv_cache.py): causal GQA attention of n new query rows over a KV
// cache, query row qi (position pos + qi, pos = cache_pos[0]) reading cache rows
// 0..pos+qi, never past the cache's last row. Decoding has n = 1, so the work is spread
// over keys instead of rows (Flash-Decoding, Dao et al. 2023, within one workgroup): one
// workgroup of WG invocations per (query row, head) walks the keys in chunks of WG.
// Per chunk, invocation i scores key k0 + i (a vec4 dot product over its cache row with
// q from workgroup memory); the chunk's max updates the running max m shared by the
// whole workgroup (online softmax, Milakov & Gimelshein 2018), so the weights
// exp(s - m) of the chunk sit in workgroup memory for the second phase (the chunk's max
// and sum: attention_cached_chunk.wgsl, or its subgroup form). There the head
// dimension is split too: invocation i owns vec4 column i % HD4 of the output and the
// keys i / HD4, + KSPLIT, ... of the chunk, reading V rows coalesced. The KSPLIT partial
// sums share m, so they are added in workgroup memory at the end and divided by l. Both
// phases' cache rows are loaded into registers when the chunk starts (load_chunk; the first
// chunk's before q is staged and rotated), so the loads of K and of V are in flight together
// and neither waits on the barriers before it: one latency of device memory per chunk instead
// of one for K plus one or more for V. On the H200 SmolLM2's decode attention over 129 keys
// took 5.20 us alone (bench/attention.py; 8.33 in an earlier session's run) and its Q4_1 decode
// step 1.011 ms of GPU time against 1.042 (bench/shader_ab.py, one call; the f32 step 1.011 against
// 1.001; bench/results/attention_held_h200/).
// Layout: q and out [n, nh * HD], k_cache and v_cache [max_seq, nkv * HD]; query head h
// reads kv head h / group. Template slots: HEAD_DIM, WG; IO (ir/ops/attention.py
// attention_io: the vec4 accessors of the q, k_cache, v_cache bindings, and out's);
// ROTATE_Q: for CachedAttentionRoPE (whose uniform starts with the RoPE fields) a
// rotate_q that rotates the query row in workgroup memory once it is loaded
// (attention_cached_rope.wgsl), for CachedAttention nothing and a rotate_q that does nothing.
// NEW_KEY: for CachedAttentionRoPEAppend of one new row (attention_cached_append.wgsl) the
// hooks that take key pos (the last one) from the op's k and v inputs instead of the cache
// and write it into the caches: stage_new loads it beside q, rotate_new rotates its key
// after q's barrier, new_score scores it in its chunk, new_value is its weighted V row
// (zero outside its chunk) and write_new appends both rows; for the other ops hooks that
// do nothing, with CACHED_END (the keys read from the cache) key_end.

const HD: u32 = {{HEAD_DIM}}u;
const HD4: u32 = (HD + 3u) / 4u;
const WG: u32 = {{WG}}u;
const KSPLIT: u32 = WG / HD4;  // key subsets of the second phase (HD4 <= WG)
const VPER: u32 = (WG + KSPLIT - 1u) / KSPLIT;  // keys of a chunk one invocation of a subset weighs

{{IO}}

var<workgroup> q_row: array<vec4<f32>, HD4>;
var<workgroup> weight: array<f32, WG>;             // scores, then exp(s - m), of a chunk
var<workgroup> partial: array<vec4<f32>, KSPLIT * HD4>;
// The chunk's cache rows this invocation reads, loaded into registers at the chunk's start (the
// first chunk's before q is staged): its key row (invocation li scores key k0 + li) and the V
// columns of its key subset, so that neither waits on the chunk's reductions.
var<private> k_held: array<vec4<f32>, HD4>;
var<private> v_held: array<vec4<f32>, VPER>;

fn load_chunk(li: u32, k0: u32, kv_col: u32, cached_end: u32) {
    let j = k0 + li;
    if (j < cached_end) {
        for (var c = 0u; c < HD4; c = c + 1u) {
            k_held[c] = k_cache4(j * p.kv_stride + kv_col, c);
        }
    }
    let part = li / HD4;
    if (part < KSPLIT) {
        let n = min(WG, select(0u, cached_end - k0, cached_end > k0));  // the chunk's keys in the cache
        for (var t = 0u; t < VPER; t = t + 1u) {
            let i = part + t * KSPLIT;
            if (i < n) {
                v_held[t] = v_cache4((k0 + i) * p.kv_stride + kv_col, li % HD4);
            }
        }
    }
}

{{ROTATE_Q}}

{{NEW_KEY}}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let wg = linear_workgroup(wid, nwg);
    if (wg >= p.total) {
        // PREFETCH_HOOK (lowering/prefetch.py)
        return;
    }
    let h = wg % p.nh;
    let qi = wg / p.nh;
    let kv_col = (h / p.group) * HD;
    let cache_rows = arrayLength(&k_cache) * VW / p.kv_stride;
    let key_end = min(cache_pos[0] + qi + 1u, cache_rows);
    let cached_end = {{CACHED_END}};
    load_chunk(li, 0u, kv_col, cached_end);
    if (li < HD4) {
        q_row[li] = q4(qi * p.q_stride + p.q_start + h * HD, li);
    }
    stage_new(li, kv_col);
    rotate_q(li, cache_pos[0] + qi);
    rotate_new(li);
    let col = li % HD4;
    let part = li / HD4;  // KSPLIT and above: idle in the second phase
    var m = MAX_INIT;
    var l = 0.0;
    var acc = vec4<f32>();
    workgroupBarrier();
    for (var k0 = 0u; k0 < key_end; k0 = k0 + WG) {
        if (k0 > 0u) {
            load_chunk(li, k0, kv_col, cached_end);
        }
        let j = k0 + li;
        var s = MAX_INIT;
        if (j < cached_end) {
            s = 0.0;
            for (var c = 0u; c < HD4; c = c + 1u) {
                s = s + dot(q_row[c], k_held[c]);
            }
            s = s * p.scale;
        } else if (j < key_end) {
            s = new_score();
        }
        let mt = max(m, chunk_max(li, s));
        let w = select(0.0, exp(s - mt), j < key_end);
        weight[li] = w;
        let lt = chunk_sum(li, w);  // after it, every weight of the chunk is in weight[]
        let corr = exp(m - mt);
        l = l * corr + lt;
        acc = acc * corr;
        if (part < KSPLIT) {
            let n = min(WG, select(0u, cached_end - k0, cached_end > k0));  // the chunk's keys in the cache
            for (var t = 0u; t < VPER; t = t + 1u) {  // the V rows load_chunk held
                let i = part + t * KSPLIT;
                if (i < n) {
                    acc = acc + weight[i] * v_held[t];
                }
            }
            if (part == 0u) {
                acc = acc + new_value(k0, col, key_end);
            }
        }
        m = mt;
        workgroupBarrier();  // the chunk's weights are read before the next chunk's scores
    }
    write_new(li, h, kv_col, key_end);
    if (part < KSPLIT) {
        partial[li] = acc;
    }
    workgroupBarrier();
    if (li < HD4) {
        var sum = vec4<f32>();
        for (var k = 0u; k < KSPLIT; k = k + 1u) {
            sum = sum + partial[k * HD4 + li];
        }
        store_out(qi * p.o_stride + h * HD, li, sum / l);
    }
}
