// Token embedding lookup from a q5_1 table (py/pagedkv/model/layout.py): embedding_nibble.wgsl.

//#include q5_1_weights.wgsl
//#include embedding_nibble.wgsl
