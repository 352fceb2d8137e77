// Token embedding lookup from a bf16 table: embedding_float.wgsl.

//#include bf16_words.wgsl
//#include embedding_float.wgsl
