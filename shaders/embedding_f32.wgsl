// Token embedding lookup from a f32 table: embedding_float.wgsl.

//#include f32_words.wgsl
//#include embedding_float.wgsl
