"""What the papers of docs/claims.md report, as the claims table's `reported` column quotes
it (depthscale.results.claims)."""

NO_NUMBER = 'no number found: full text not found or not read here'
# numbers seen only in others' summaries of the paper are not quoted: they could not be checked
SECONDARY = 'no number quoted: only secondary summaries were reached, not the paper'

# what the papers report, from their full text (table, figure or section cited); 'loss gap':
# the natural-log cross-entropy difference a - b (ln of the perplexity ratio where the paper
# gives perplexities)
XIONG_NO_WARMUP = ('IWSLT14 De-En Transformer, Adam, no warmup: Post-LN BLEU 8.45; Pre-LN BLEU ~34, '
                   'val loss ~4; Post-LN loss only as curves (Sections 3.2, 4.2, Figures 2, 4)')
XIONG_WARMUP = ('IWSLT14 De-En Transformer, Adam: Post-LN BLEU 8.45 without warmup vs ~34 with 4,000 '
                'warmup steps (31.16 / 2.77 with 500 steps at lr 5e-4 / 1e-3); no loss number, curves '
                'only (Section 3.2, Figure 2)')
# DeepNet's Table 1 is an image in every copy found; its Section 5.1 text (read in a bilingual
# copy of the paper) gives the numbers below, and no Pre-LN BLEU at a given depth
DEEPNET_PRE = ('WMT-17 En-De, base size: DeepNet reaches BLEU 28.9 at 100L-100L and outperforms all '
               'Pre-LN baselines; the Pre-LN BLEU per depth (Table 1, an image) not read; no loss number '
               '(Section 5.1 text)')
DEEPNET_POST = ('WMT-17 En-De, base size: Pre-LN is 0.5-1.0 BLEU below the converged Post-LN models; '
                'Post-LN diverges at 50L-50L and deeper; no loss number (Section 5.1 text; Table 1, an '
                'image, not read)')
MIXLN_PRE = ('LLaMA-1B, 5B tokens (C4): Mix-LN ppl 18.18 vs Pre-LN 18.65, -2.5% ppl, loss gap -0.026 '
             '(Table 1, v1)')
MIXLN_POST = ('LLaMA-130M, 2.2B tokens (C4): Mix-LN ppl 26.07 vs Post-LN 26.95, -3.3% ppl, loss gap '
              '-0.033; Post-LN diverges at 250M and 1B (ppl 1409, 1412) (Table 1, v1)')
COD_LNS = ('LLaMA-1B, 8.9B tokens (C4): LNS ppl 15.71 vs Pre-LN 17.02, -7.7% ppl, loss gap -0.080 '
           '(Table 1, v1)')
DYT_LM = ('LLaMA 7B, 200B tokens (The Pile): train loss DyT 1.60 vs RMSNorm 1.59, gap +0.01; 70B: '
          '1.45 vs 1.45 (Table 4; the LLM baseline is RMSNorm)')
DERF_LN = ('GPT-2 124M, OpenWebText: val loss Derf 2.94 vs LN 2.94, gap 0.00 (Table 12; tokens not '
           'given there; its gains over LN are in vision, speech, DNA)')
DERF_DYT = 'GPT-2 124M, OpenWebText: val loss Derf 2.94 vs DyT 2.97, gap -0.03 (Table 12)'
ATTNRES_REPORTED = ('Block AttnRes reaches the loss of a baseline with 1.25x its compute (scaling-law '
                    'fit); Kimi Linear 48B (3B active), 1.4T tokens: MMLU 74.6 vs 73.5; no loss number '
                    'read (official README; the paper\'s tables not read)')
KEEL_REPORTED = ('no loss or perplexity number: loss only as curves (Figures 5, 8; at peak rate 1.5e-3 '
                 'Pre-LN\'s training loss is slightly lower than Keel\'s); 512L d1024 (3B), 1T tokens: '
                 'benchmark average Keel 62.5 vs Pre-LN 58.7 (Table 6); 256L (3B), FineWeb-Edu 40B '
                 'tokens: 68.2 vs 66.7 (Table 4) (arXiv 2601.19895 v2)')
DENSEFORMER_REPORTED = ('48 blocks, 378M params, OpenWebText2, 40k steps x 400 x 256 tokens (4.1B): ppl '
                        'DenseFormer 17.84 vs Transformer 18.61, -4.1% ppl, loss gap -0.042; 72 blocks: '
                        '17.12 vs 17.82, loss gap -0.040 (Table 1, 3 seeds)')
LAYERDROP_REPORTED = ('WikiText-103 (100M tokens), 16-layer 247M adaptive-input Transformer, LayerDrop p '
                      '0.2: test ppl 18.3 vs 18.7, -2.1% ppl, loss gap -0.022 (Table 2)')
SUBLN_REPORTED = ('no loss number: causal LM (GPT-3 Medium 350M config at 24L, 500K steps; 48L, 72L) '
                  'reported as zero-shot and few-shot accuracy (Tables 1-3, images, not read); in the text: '
                  'BERT-base MLM, 125K steps: GLUE +0.6 on average over Post-LN and Pre-LN (Section 4.2); '
                  'OPUS-100 18L-18L: +0.5 BLEU over Pre-LN, +0.6 over NormFormer (Section 4.3) (arXiv '
                  '2210.06423, read in a bilingual copy)')
RELAXED_REPORTED = ('recursive Gemma 1B (from Gemma 2B): up to +13.5 few-shot accuracy over a Gemma 1B '
                    'pretrained from scratch; with distillation, 60B uptraining tokens, on par with the '
                    'full Gemma 2B (Section 1); the relaxed-vs-recursive gap (Section 3) not read; no loss '
                    'number read')
MHC_REPORTED = ('27B MoE (4.14B active, 30 layers, n 4), 262B tokens: final training loss 0.021 below '
                'the residual baseline, gap -0.021 (Section 5.2, Figure 5a; sizes and tokens Table 5); '
                'BBH 51.0 vs 43.8, MMLU 63.4 vs 59.0 (Table 4)')
PERILN_REPORTED = SECONDARY
PRIMER_REPORTED = SECONDARY
GROMOV_REPORTED = ('Llama-2 7B-70B, Qwen, Mistral-7B, Phi-2, healed by QLoRA on 164M or 328M C4 tokens: 5-shot '
                   'MMLU stays near the unpruned score until 45%-55% of the layers are removed (Llama-2), 35% '
                   '(Mistral-7B), 25% (Phi-2), 20% (Qwen) (Section 4.1, Figure 2); C4 validation loss after '
                   'healing rises slowly and linearly with the fraction removed, curves only (Section 4.2, '
                   'Figure 3): no loss number')
COMPLETEP_REPORTED = ('abstract: CompleteP (alpha = 1) gives depth-wise HP transfer, non-lazy learning in all '
                      'layers and "12-34% compute efficiency improvements over the prior state-of-the-art"; no loss '
                      'gap or per-depth optimum read (the full text not reached) (arXiv 2505.01618)')
UT_REPORTED = ('WMT14 En-De, same parameter count: UT base BLEU 28.9 vs Transformer base 28.0 (Table 7); '
               'LAMBADA LM, control set: UT base 6 steps ppl 131 vs Transformer 142, loss gap -0.081 (Table 3)')
PRORES_REPORTED = ('Pre-LN 1.3B, 50B C4 tokens: ppl ProRes 9.86 vs 10.32, -4.5% ppl, loss gap -0.046 (350M: '
                   '11.74 vs 12.36, gap -0.052; 130M: 14.30 vs 14.67, gap -0.026) (Table 2); 350M, 6B tokens, '
                   'linear schedule over 24k steps: 14.43 vs 15.21, gap -0.053 (Table 6); depth 12-120 layers '
                   'as curves only (Figure 1) (arXiv 2603.05369 v1)')
MODA_REPORTED = ('1.5B, 400B tokens, against OLMo2-1.5B: C4 ppl MoDA 15.97 vs 16.16, -1.2% ppl, loss gap '
                 '-0.012 (mean of 10 validation sets 13.47 vs 13.67, gap -0.015); 700M: C4 18.29 vs 18.32, gap '
                 '-0.002; downstream average 64.39 vs 62.28 (official README tables)')
LLR_REPORTED = ('LLaMA 1B on FineWeb: validation ppl LLR 9.59 vs uniform rate 9.77, -1.8% ppl, loss gap -0.019 '
                '(350M: 12.71 vs 12.96, gap -0.019; 135M: 17.03 vs 17.86, gap -0.048; 60M: 20.30 vs 21.94, gap '
                '-0.078); tokens per size not given there (abstract: up to 100B); 1B zero-shot average 49.02 vs '
                '47.09 (official README tables)')
QKSLOW_REPORTED = ('abstract (arXiv 2605.10504 v1): temporarily slowing only the upper layers\' Q and K '
                   'projections early in training improves a 270M GPT-style decoder\'s final perplexity, token '
                   'efficiency and downstream accuracy, and is nearly unnecessary in LLaMA-style blocks (gated '
                   'FFNs); no number read (the full text not reached)')
MUP_REPORTED = ('the optimal rate across width as curves only (Figure 1: Transformers on WikiText-2 at d 128 '
                '-8192; Figure 3: MLP): no number; tuned on a 40M proxy (7% of pretraining compute), GPT-3 6.7B: '
                'validation loss 1.98 vs 2.03 for a re-run with the original HPs, gap -0.05 (the re-run used '
                'absolute attention and FP16) (Table 7); from a 13M proxy, BERT-large: test loss 1.683 vs '
                'Megatron default 1.731, gap -0.048 (BERT-base 1.970 vs 1.995, gap -0.025) (Table 6) (arXiv '
                '2203.03466 v2)')
DEEPSCALELM_REPORTED = ('the ICLR 2024 submission\'s abstract (OpenReview): deep models improve perplexity by 1.0 '
                        'point and downstream tasks by 2.2 points over shallow ones at equal parameters, and beat '
                        'shallow models with twice the parameters (BERT-style masked LM; the base perplexity not '
                        'given there, so no loss gap); the published abstract (arXiv 2403.09635, up to 1000 layers) '
                        'gives no number; the full tables not read')
CSORDAS_REPORTED = ('analysis of trained models (Llama 3.1 70B on GSM8K; Qwen, OLMo 2 in the appendix): '
                    'second-half layers contribute less to the residual and skipping one barely changes later '
                    'layers or future tokens, as plots only (Section 3, Figures 2, 3); yet they are as important '
                    'for the current token\'s prediction (Figure 17a); no loss number (arXiv 2505.13898)')
DEPTHBENCH_REPORTED = ('10 architectures, each at a fixed size and recipe over d_model / n_layer: Pre-LN and most '
                       'norm- and scaling-based variants "provide little benefit and can even degrade performance" '
                       'as shapes get deeper and narrower (abstract); ' + NO_NUMBER)
TP6_REPORTED = ('resnets with one layer per block: Depth-muP (branch a/sqrt(L), Adam rate eta/sqrt(L)) '
                'admits depthwise HP transfer, shown empirically; with two or more layers per block (MLP '
                'blocks; a Megatron Transformer on Common Crawl) the optimal HPs shift with depth and do '
                'worse (Sections 1.2, 1.3); no loss number read (the experiments\' figures not read) (arXiv '
                '2310.02244 v5)')
BORDELON_REPORTED = ('abstract (arXiv 2309.16620 v2): ResNets and Vision Transformers with 1/sqrt(depth) '
                     'branches and muP transfer the optimal HPs across width and depth on CIFAR-10 and '
                     'ImageNet; no language model, no number read (the full text not reached)')
PARALLEL_REPORTED = ('PaLM (Section 2, Parallel Layers): ablations "showed a small quality degradation at 8B '
                     'scale but no quality degradation at 62B scale", no number given; about 15% faster training '
                     'at large scale; no loss number (GPT-J, GPT-NeoX: none read)')
LAYERNORM_REPORTED = ('no Transformer or language-model loss number (recurrent models): DRAW, binarized MNIST, '
                      '200 epochs: test NLL 82.09 vs 82.36 nats, gap -0.27 nats per image (Section 6.4); order '
                      'embeddings reach their best validation model in 60% of the baseline\'s time (Section 6.1); '
                      'attentive reader, handwriting: curves only (Figures 2, 5) (arXiv 1607.06450)')
