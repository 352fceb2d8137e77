// Token embedding lookup from a q5_K table (py/pagedkv/model/layout.py): embedding_nibble.wgsl.

//#include q5_K_weights.wgsl
//#include embedding_nibble.wgsl
