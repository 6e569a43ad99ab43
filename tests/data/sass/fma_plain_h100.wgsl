
struct P { steps: u32, seed: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> out: array<vec4<f32>>;
var<workgroup> tiles: array<vec4<f32>, 512>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let s = p.seed + f32(li) * 1e-7;
    var a0 = vec4<f32>(s, s + 1e-7, s + 2e-7, s + 3e-7);
    var a1 = a0 * 0.5;
    var a2 = a0 * 0.75;
    var a3 = a0 * 0.125;
    var b = a0 * 0.25;
    for (var i = li; i < 512u; i = i + 256u) {  // every quad the reads below may take
        tiles[i] = a0 * f32(i + 1u) * 1e-3;
    }
    workgroupBarrier();
    var c0 = vec4<f32>();
    var c1 = vec4<f32>();
    var c2 = vec4<f32>();
    var c3 = vec4<f32>();
    var c4 = vec4<f32>();
    var c5 = vec4<f32>();
    var c6 = vec4<f32>();
    var c7 = vec4<f32>();
    for (var t = 0u; t < p.steps; t = t + 1u) {
        c0 = fma(vec4<f32>(a0.x), b, c0); c1 = fma(vec4<f32>(a0.y), b, c1);
        c2 = fma(vec4<f32>(a0.z), b, c2); c3 = fma(vec4<f32>(a0.w), b, c3);
        c4 = fma(vec4<f32>(a1.x), b, c4); c5 = fma(vec4<f32>(a1.y), b, c5);
        c6 = fma(vec4<f32>(a1.z), b, c6); c7 = fma(vec4<f32>(a1.w), b, c7);
        c0 = fma(vec4<f32>(a0.x), b, c0); c1 = fma(vec4<f32>(a0.y), b, c1);
        c2 = fma(vec4<f32>(a0.z), b, c2); c3 = fma(vec4<f32>(a0.w), b, c3);
        c4 = fma(vec4<f32>(a1.x), b, c4); c5 = fma(vec4<f32>(a1.y), b, c5);
        c6 = fma(vec4<f32>(a1.z), b, c6); c7 = fma(vec4<f32>(a1.w), b, c7);
        c0 = fma(vec4<f32>(a0.x), b, c0); c1 = fma(vec4<f32>(a0.y), b, c1);
        c2 = fma(vec4<f32>(a0.z), b, c2); c3 = fma(vec4<f32>(a0.w), b, c3);
        c4 = fma(vec4<f32>(a1.x), b, c4); c5 = fma(vec4<f32>(a1.y), b, c5);
        c6 = fma(vec4<f32>(a1.z), b, c6); c7 = fma(vec4<f32>(a1.w), b, c7);
        c0 = fma(vec4<f32>(a0.x), b, c0); c1 = fma(vec4<f32>(a0.y), b, c1);
        c2 = fma(vec4<f32>(a0.z), b, c2); c3 = fma(vec4<f32>(a0.w), b, c3);
        c4 = fma(vec4<f32>(a1.x), b, c4); c5 = fma(vec4<f32>(a1.y), b, c5);
        c6 = fma(vec4<f32>(a1.z), b, c6); c7 = fma(vec4<f32>(a1.w), b, c7);
        c0 = fma(vec4<f32>(a0.x), b, c0); c1 = fma(vec4<f32>(a0.y), b, c1);
        c2 = fma(vec4<f32>(a0.z), b, c2); c3 = fma(vec4<f32>(a0.w), b, c3);
        c4 = fma(vec4<f32>(a1.x), b, c4); c5 = fma(vec4<f32>(a1.y), b, c5);
        c6 = fma(vec4<f32>(a1.z), b, c6); c7 = fma(vec4<f32>(a1.w), b, c7);
        c0 = fma(vec4<f32>(a0.x), b, c0); c1 = fma(vec4<f32>(a0.y), b, c1);
        c2 = fma(vec4<f32>(a0.z), b, c2); c3 = fma(vec4<f32>(a0.w), b, c3);
        c4 = fma(vec4<f32>(a1.x), b, c4); c5 = fma(vec4<f32>(a1.y), b, c5);
        c6 = fma(vec4<f32>(a1.z), b, c6); c7 = fma(vec4<f32>(a1.w), b, c7);
        c0 = fma(vec4<f32>(a0.x), b, c0); c1 = fma(vec4<f32>(a0.y), b, c1);
        c2 = fma(vec4<f32>(a0.z), b, c2); c3 = fma(vec4<f32>(a0.w), b, c3);
        c4 = fma(vec4<f32>(a1.x), b, c4); c5 = fma(vec4<f32>(a1.y), b, c5);
        c6 = fma(vec4<f32>(a1.z), b, c6); c7 = fma(vec4<f32>(a1.w), b, c7);
        c0 = fma(vec4<f32>(a0.x), b, c0); c1 = fma(vec4<f32>(a0.y), b, c1);
        c2 = fma(vec4<f32>(a0.z), b, c2); c3 = fma(vec4<f32>(a0.w), b, c3);
        c4 = fma(vec4<f32>(a1.x), b, c4); c5 = fma(vec4<f32>(a1.y), b, c5);
        c6 = fma(vec4<f32>(a1.z), b, c6); c7 = fma(vec4<f32>(a1.w), b, c7);

    }
    let sum = c0 + c1 + c2 + c3 + c4 + c5 + c6 + c7;
    if (dot(sum, vec4<f32>(1.0)) == 12345.678) {  // never: keeps every FMA
        out[gid.x] = sum;
    }
}
