// Token embedding lookup from a q4_0 table (py/pagedkv/model/layout.py): embedding_nibble.wgsl.

//#include q4_0_weights.wgsl
//#include embedding_nibble.wgsl
