//#include "common.wgsl"
// LSTMRecurrence, GRURecurrence and RNNRecurrence (ir/ops/recurrent.py recurrence_ref): the time
// loop of ONNX LSTM / GRU / RNN (https://onnx.ai/onnx/operators/onnx__LSTM.html, __GRU, __RNN)
// in one dispatch. A workgroup runs one (direction, batch entry) through its whole sequence:
// invocation li owns the hidden units j = li + u * WG (u < UPI), keeping their h (and LSTM's
// c, GRU's z) in registers; the previous step's h of every unit sits in workgroup memory
// (h_prev), which each step's gate dot products r[row] . h_prev read, and a barrier
// separates the steps (GRU's default reset, (r * h) Rh^T, needs every unit's r * h: one more
// barrier, through rh). xw holds X W^T + Wb of every step (a matmul before this kernel);
// the kernel adds the recurrence r h + rb (GRU with linear_before_reset: r * (Rh h + Rbh)).
// Steps t >= len are zero rows of Y; a direction that is reversed walks t = len-1 .. 0;
// the final h (and c) go after Y in the packed output (zero for an empty sequence, as
// onnxruntime). Params.batch_major is ONNX's layout attribute (1: [B, S, ..] tensors).
// Template slots: HIDDEN, GATES, WG, UNITS (UPI), SHARED (GRU's rh), ACTIVATIONS (act0.. of
// the cell's functions, per direction), CLIP (the bound on every gate input), SEQ_LEN
// (p.seq, or this entry's seq_lens), CELL (one step of the cell into h_reg), INIT and
// FINAL (LSTM's c: loaded from c0, stored as Y_c).

const H: u32 = {{HIDDEN}}u;
const G: u32 = {{GATES}}u;
const WG: u32 = {{WG}}u;
const UPI: u32 = {{UNITS}}u;

var<workgroup> h_prev: array<f32, H>;
{{SHARED}}

{{ACTIVATIONS}}

fn pre(x: f32) -> f32 {
    return {{CLIP}};
}

// r[row] . h_prev: one gate's recurrence for one unit (r is [dirs, G*H, H], row-major)
fn rdot(row: u32) -> f32 {
    var s = 0.0;
    let base = row * H;
    for (var m = 0u; m < H; m = m + 1u) {
        s = s + r[base + m] * h_prev[m];
    }
    return s;
}

fn state_index(dir: u32, b: u32, j: u32) -> u32 {
    if (p.batch_major == 0u) {
        return (dir * p.batch + b) * H + j;
    }
    return (b * p.dirs + dir) * H + j;
}

fn y_index(t: u32, dir: u32, b: u32, j: u32) -> u32 {
    if (p.batch_major == 0u) {
        return ((t * p.dirs + dir) * p.batch + b) * H + j;
    }
    return ((b * p.seq + t) * p.dirs + dir) * H + j;
}

fn xw_row(t: u32, b: u32) -> u32 {
    if (p.batch_major == 0u) {
        return (t * p.batch + b) * p.dirs * G * H;
    }
    return (b * p.seq + t) * p.dirs * G * H;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let wg = linear_workgroup(wid, nwg);
    if (wg >= p.total) {
        return;
    }
    let b = wg % p.batch;
    let dir = wg / p.batch;
    let reverse = p.reverse_all != 0u || dir == 1u;
    let len = {{SEQ_LEN}};
    let rrow = dir * G * H;  // this direction's first row of r and entry of rb
    var h_reg: array<f32, UPI>;
    var c_reg: array<f32, UPI>;
    var z_reg: array<f32, UPI>;
    for (var u = 0u; u < UPI; u = u + 1u) {
        let j = li + u * WG;
        if (j < H) {
            h_reg[u] = h0[state_index(dir, b, j)];
            h_prev[j] = h_reg[u];
{{INIT}}
        }
    }
    workgroupBarrier();
    for (var step = 0u; step < len; step = step + 1u) {
        let t = select(step, len - 1u - step, reverse);
        let xb = xw_row(t, b) + rrow;
{{CELL}}
        workgroupBarrier();
        for (var u = 0u; u < UPI; u = u + 1u) {
            let j = li + u * WG;
            if (j < H) {
                h_prev[j] = h_reg[u];
                out[y_index(t, dir, b, j)] = h_reg[u];
            }
        }
        workgroupBarrier();
    }
    for (var u = 0u; u < UPI; u = u + 1u) {
        let j = li + u * WG;
        if (j < H) {
            for (var t = len; t < p.seq; t = t + 1u) {
                out[y_index(t, dir, b, j)] = 0.0;
            }
            out[p.yh_off + state_index(dir, b, j)] = select(0.0, h_reg[u], len > 0u);
{{FINAL}}
        }
    }
}
