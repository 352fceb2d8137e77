// NORM prologue shared by the quantized matvec_* kernels (expanded by ShaderLibrary at their `//#include
// matvec_norm.wgsl` line): their `params` at binding 4, after qs, the scales, x and y.

@group(0) @binding(4) var<uniform> params : Params;
//#include matvec_gain.wgsl
