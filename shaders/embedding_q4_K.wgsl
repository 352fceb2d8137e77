// Token embedding lookup from a q4_K table (py/pagedkv/model/layout.py): embedding_nibble.wgsl.

//#include q4_K_weights.wgsl
//#include embedding_nibble.wgsl
