// Token embedding lookup from a q5_0 table (py/pagedkv/model/layout.py): embedding_nibble.wgsl.

//#include q5_0_weights.wgsl
//#include embedding_nibble.wgsl
