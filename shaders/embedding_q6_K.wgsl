// Token embedding lookup from a q6_K table (py/pagedkv/model/layout.py): embedding_nibble.wgsl.

//#include q6_K_weights.wgsl
//#include embedding_nibble.wgsl
