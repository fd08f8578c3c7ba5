//! The generated corpus of the speed benchmark: `n` markdown notes (10,000 ≈ 50 MB), the same
//! bytes for the same seed, mixed English (≈70% of notes) and Chinese (≈30%, with English terms
//! in them), each with YAML front matter (title, tags, created), a `#` title, `##`/`###`
//! sections of paragraphs, lists and fenced code blocks, spread over 100 folders. Words follow
//! a skewed (Zipf-like) distribution over fixed vocabularies, so common and rare terms both
//! exist. Also the benchmark's query mixes, drawn from the same vocabularies.
use std::path::{Path, PathBuf};

/// English vocabulary (common first: they are drawn more often).
#[rustfmt::skip]
pub const EN: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "for", "that", "with", "on", "as", "by", "this", "from", "at", "an", "be",
    "are", "we", "it", "or", "can", "which", "not", "have", "data", "system", "time", "file", "user", "service",
    "process", "index", "query", "search", "model", "value", "memory", "network", "server", "client", "request",
    "response", "error", "result", "function", "method", "table", "record", "storage", "cache", "latency",
    "throughput", "design", "review", "meeting", "project", "release", "feature", "change", "update", "version",
    "config", "setting", "policy", "access", "token", "secret", "vault", "gateway", "session", "tool", "agent",
    "prompt", "context", "document", "note", "chapter", "section", "heading", "paragraph", "summary", "question",
    "answer", "idea", "plan", "budget", "schedule", "deadline", "customer", "market", "product", "price", "invoice",
    "contract", "team", "manager", "engineer", "research", "paper", "experiment", "measurement", "benchmark",
    "analysis", "report", "garden", "kitchen", "recipe", "travel", "flight", "hotel", "museum", "mountain", "river",
    "forest", "weather", "winter", "summer", "morning", "evening", "coffee", "tea", "bread", "cheese", "apple",
    "orange", "bicycle", "train", "station", "library", "school", "student", "teacher", "lecture", "exam",
    "history", "science", "physics", "chemistry", "biology", "music", "guitar", "piano", "concert", "movie",
    "novel", "poem", "painting", "camera", "photo", "health", "doctor", "exercise", "running", "swimming", "sleep",
    "dream", "family", "friend", "birthday", "holiday", "wedding", "neighbor", "city", "village", "street",
    "building", "bridge", "harbor", "island", "ocean", "planet", "galaxy", "telescope", "satellite", "rocket",
    "engine", "turbine", "propeller", "wing", "airfoil", "pressure", "velocity", "temperature", "boundary", "layer",
    "turbulence", "viscosity", "compression", "shock", "wave", "frequency", "signal", "filter", "sensor", "battery",
    "voltage", "circuit", "transistor", "compiler", "parser", "grammar", "syntax", "semantics", "type", "trait",
    "struct", "closure", "iterator", "thread", "mutex", "channel", "socket", "protocol", "packet", "router",
    "firewall", "certificate", "encryption", "signature", "hash", "checksum", "backup", "restore", "migration",
    "schema", "transaction", "commit", "rollback", "branch", "merge", "conflict", "deploy", "container", "cluster",
    "scheduler", "queue", "worker", "timeout", "retry", "backoff", "deadlock", "profiler", "allocation", "garbage",
    "collector", "pointer", "reference", "lifetime", "borrow", "ownership", "generic", "macro", "module", "crate",
    "package", "dependency", "license", "documentation", "tutorial", "example", "exercise", "solution", "problem",
    "theorem", "proof", "lemma", "matrix", "vector", "tensor", "gradient", "optimizer", "learning", "training",
    "inference", "embedding", "retrieval", "ranking", "relevance", "precision", "recall", "quality", "performance",
    "reliability", "security", "privacy", "audit", "compliance", "incident", "outage", "postmortem", "monitoring",
    "alert", "dashboard", "metric", "histogram", "percentile", "quantile", "sampling", "estimate", "forecast",
    "inventory", "warehouse", "shipment", "delivery", "quokka", "zephyr", "obsidian", "marmalade", "labyrinth",
    "kaleidoscope", "serendipity", "nebula", "aurora",
];

/// Chinese vocabulary (two-character words mostly; common first).
#[rustfmt::skip]
pub const ZH: &[&str] = &[
    "我们", "他们", "这个", "那个", "可以", "没有", "因为", "所以", "但是", "如果", "已经", "现在", "今天", "明天", "昨天", "时间", "问题", "方法",
    "系统", "数据", "文件", "用户", "服务", "网络", "内存", "索引", "查询", "搜索", "模型", "结果", "错误", "请求", "响应", "函数", "表格", "记录",
    "存储", "缓存", "延迟", "设计", "会议", "项目", "发布", "功能", "变化", "更新", "版本", "配置", "设置", "策略", "访问", "令牌", "秘密", "网关",
    "会话", "工具", "代理", "上下文", "文档", "笔记", "章节", "标题", "段落", "总结", "答案", "想法", "计划", "预算", "日程", "客户", "市场", "产品",
    "价格", "合同", "团队", "经理", "工程师", "研究", "论文", "实验", "测量", "分析", "报告", "花园", "厨房", "食谱", "旅行", "航班", "酒店", "博物馆",
    "山脉", "河流", "森林", "天气", "冬天", "夏天", "早上", "晚上", "咖啡", "茶叶", "面包", "苹果", "橙子", "自行车", "火车", "车站", "图书馆", "学校",
    "学生", "老师", "考试", "历史", "科学", "物理", "化学", "生物", "音乐", "吉他", "钢琴", "电影", "小说", "诗歌", "绘画", "相机", "照片", "健康",
    "医生", "锻炼", "跑步", "游泳", "睡眠", "梦想", "家庭", "朋友", "生日", "假期", "婚礼", "邻居", "城市", "村庄", "街道", "大楼", "桥梁", "港口",
    "海岛", "海洋", "星球", "银河", "卫星", "火箭", "发动机", "压力", "速度", "温度", "边界", "湍流", "频率", "信号", "电池", "电压", "电路", "编译器",
    "语法", "线程", "通道", "协议", "路由器", "防火墙", "证书", "加密", "签名", "备份", "恢复", "迁移", "事务", "提交", "回滚", "分支", "合并", "冲突",
    "部署", "容器", "集群", "调度", "队列", "超时", "重试", "机器学习", "向量", "梯度", "训练", "推理", "检索", "排序", "质量", "性能", "可靠性", "安全",
    "隐私", "审计", "事故", "监控", "告警", "指标", "库存", "仓库", "快递", "熊猫", "长城",
];

/// Tags drawn for front matter.
const TAGS: &[&str] =
    &["work", "personal", "research", "draft", "todo", "idea", "reading", "travel", "rust", "ops", "研究", "生活"];

const CODE: &[&str] = &[
    "fn main() {\n    let index = build_index(&notes)?;\n    println!(\"{} documents\", index.len());\n}\n",
    "def search(query, limit=10):\n    hits = engine.query(query)\n    return sorted(hits, key=score)[:limit]\n",
    "SELECT path, bm25(chunks) AS score\nFROM chunks WHERE chunks MATCH 'retrieval'\nORDER BY score LIMIT 10;\n",
    "const cache = new Map();\nfunction lookup(key) {\n  return cache.get(key) ?? fetchFromServer(key);\n}\n",
    "#!/usr/bin/env bash\nset -euo pipefail\nrsync -a notes/ backup/ && echo done\n",
];

/// One generated note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// Path relative to the corpus root, e.g. `area-07/note-00042.md`.
    pub path: PathBuf,
    pub text: String,
}

/// Deterministic generator of the notes (an iterator of [`Note`]).
pub struct Corpus {
    rng: fastrand::Rng,
    next: usize,
    n: usize,
}

impl Corpus {
    /// `n` notes from `seed`.
    pub fn new(seed: u64, n: usize) -> Self {
        Self { rng: fastrand::Rng::with_seed(seed), next: 0, n }
    }

    /// Writes every note under `root` (folders created); returns `(notes, bytes)`.
    ///
    /// # Errors
    /// When a file cannot be written.
    pub fn write(self, root: &Path) -> std::io::Result<(usize, u64)> {
        let (mut notes, mut bytes) = (0, 0);
        for note in self {
            let path = root.join(&note.path);
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            std::fs::write(&path, &note.text)?;
            notes += 1;
            bytes += note.text.len() as u64;
        }
        Ok((notes, bytes))
    }
}

/// A skewed pick from `words`: low indexes (the common words) far more often.
fn pick<'a>(rng: &mut fastrand::Rng, words: &[&'a str]) -> &'a str {
    let i = (rng.f64().powf(2.2) * words.len() as f64) as usize;
    words[i.min(words.len() - 1)]
}

fn en_sentence(rng: &mut fastrand::Rng, out: &mut String) {
    let len = rng.usize(6..18);
    for i in 0..len {
        let w = pick(rng, EN);
        if i == 0 {
            let mut c = w.chars();
            if let Some(f) = c.next() {
                out.extend(f.to_uppercase());
                out.push_str(c.as_str());
            }
        } else {
            out.push(' ');
            out.push_str(w);
        }
    }
    out.push_str(if rng.u8(..10) == 0 { "? " } else { ". " });
}

fn zh_sentence(rng: &mut fastrand::Rng, out: &mut String) {
    let len = rng.usize(5..14);
    for i in 0..len {
        if i > 0 && rng.u8(..6) == 0 {
            out.push('，');
        }
        if rng.u8(..12) == 0 {
            // English terms inside Chinese prose, as real notes have.
            out.push(' ');
            out.push_str(pick(rng, EN));
            out.push(' ');
        } else {
            out.push_str(pick(rng, ZH));
        }
    }
    out.push('。');
}

fn title(rng: &mut fastrand::Rng, zh: bool) -> String {
    let n = rng.usize(2..5);
    let words: Vec<&str> = (0..n).map(|_| if zh { pick(rng, &ZH[20..]) } else { pick(rng, &EN[25..]) }).collect();
    if zh { words.concat() } else { words.join(" ") }
}

impl Iterator for Corpus {
    type Item = Note;

    fn next(&mut self) -> Option<Note> {
        if self.next >= self.n {
            return None;
        }
        let i = self.next;
        self.next += 1;
        let rng = &mut self.rng;
        let zh = rng.u8(..10) < 3;
        let target = rng.usize(1_500..8_500);
        let t = title(rng, zh);
        let tags: Vec<&str> = (0..rng.usize(1..4)).map(|_| TAGS[rng.usize(..TAGS.len())]).collect();
        let mut text = format!(
            "---\ntitle: \"{t}\"\ntags: [{}]\ncreated: 2026-{:02}-{:02}\n---\n\n# {t}\n\n",
            tags.join(", "),
            rng.u8(1..13),
            rng.u8(1..29)
        );
        while text.len() < target {
            let level = if rng.u8(..3) == 0 { "###" } else { "##" };
            text.push_str(&format!("{level} {}\n\n", title(rng, zh)));
            for _ in 0..rng.usize(1..4) {
                match rng.u8(..10) {
                    0 => text.push_str(&format!("```\n{}```\n\n", CODE[rng.usize(..CODE.len())])),
                    1 => {
                        for _ in 0..rng.usize(2..5) {
                            text.push_str("- ");
                            if zh {
                                zh_sentence(rng, &mut text)
                            } else {
                                en_sentence(rng, &mut text)
                            }
                            text.push('\n');
                        }
                        text.push('\n');
                    }
                    _ => {
                        for _ in 0..rng.usize(2..6) {
                            if zh { zh_sentence(rng, &mut text) } else { en_sentence(rng, &mut text) }
                        }
                        text.push_str("\n\n");
                    }
                }
            }
        }
        if i.is_multiple_of(RARE_EVERY) {
            text.push_str(&format!("\nArchive code: `{}`\n", rare_token(i)));
        }
        Some(Note { path: PathBuf::from(format!("area-{:02}/note-{i:05}.md", i % 100)), text })
    }
}

/// Every this many notes (note 0, 667, 1334, …) one carries a rare token ([`rare_token`]).
pub const RARE_EVERY: usize = 667;

/// The rare token of note `i` (a multiple of [`RARE_EVERY`]): `ARCHIVE-00667`; it occurs in that
/// note only, so a search for it must read every file.
pub fn rare_token(i: usize) -> String {
    format!("ARCHIVE-{i:05}")
}

/// The rare tokens of a corpus of `n` notes.
pub fn rare_tokens(n: usize) -> Vec<String> {
    (0..n).step_by(RARE_EVERY).map(rare_token).collect()
}

/// `n` search queries from `seed`: ≈70% English (two or three words, from the less common part
/// of the vocabulary so they are selective), ≈30% Chinese (one or two words).
pub fn queries(seed: u64, n: usize) -> Vec<String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..n)
        .map(|_| {
            if rng.u8(..10) < 3 {
                let k = rng.usize(1..3);
                (0..k).map(|_| ZH[rng.usize(10..ZH.len())]).collect::<Vec<_>>().join(" ")
            } else {
                let k = rng.usize(2..4);
                (0..k).map(|_| EN[rng.usize(25..EN.len())]).collect::<Vec<_>>().join(" ")
            }
        })
        .collect()
}

/// `n` literal patterns for the grep engine and `rg` from `seed`: single words, ≈30% Chinese.
pub fn patterns(seed: u64, n: usize) -> Vec<String> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..n)
        .map(|_| {
            if rng.u8(..10) < 3 {
                ZH[rng.usize(10..ZH.len())].to_owned()
            } else {
                EN[rng.usize(60..EN.len())].to_owned()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fnv(bytes: &[u8], mut h: u64) -> u64 {
        for b in bytes {
            h = (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        h
    }

    #[test]
    fn same_seed_same_bytes_and_about_50_mb_for_10k_notes() {
        let digest = |seed| {
            Corpus::new(seed, 300).fold(0xcbf2_9ce4_8422_2325, |h, n| {
                fnv(n.text.as_bytes(), fnv(n.path.as_os_str().as_encoded_bytes(), h))
            })
        };
        assert_eq!(digest(7), digest(7));
        assert_ne!(digest(7), digest(8));
        let (mut count, mut bytes, mut zh, mut code, mut front) = (0usize, 0usize, 0usize, 0usize, 0usize);
        for n in Corpus::new(42, 10_000) {
            count += 1;
            bytes += n.text.len();
            zh += usize::from(n.text.contains("。"));
            code += usize::from(n.text.contains("```"));
            front += usize::from(n.text.starts_with("---\ntitle: ") && n.text.contains("\ntags: ["));
        }
        assert_eq!(count, 10_000);
        assert!((45_000_000..55_000_000).contains(&bytes), "{bytes} bytes");
        assert!((2_000..4_000).contains(&zh), "{zh} Chinese notes");
        assert!(code > 5_000, "{code} notes with code");
        assert_eq!(front, 10_000);
        assert_eq!(rare_tokens(10_000).len(), 15);
        let mut notes = Corpus::new(42, 700);
        let with = |t: &str, n: &Note| n.text.contains(t);
        let holders: Vec<PathBuf> = notes.by_ref().filter(|n| with("ARCHIVE-", n)).map(|n| n.path).collect();
        assert_eq!(holders, [PathBuf::from("area-00/note-00000.md"), PathBuf::from("area-67/note-00667.md")]);
        let first = Corpus::new(42, 1).next().expect("a note");
        assert_eq!(first.path, Path::new("area-00/note-00000.md"));
        assert!(first.text.contains("\n# ") && first.text.contains("\n## "), "{}", first.text);
    }

    #[test]
    fn queries_and_patterns_are_deterministic_and_mixed() {
        assert_eq!(queries(1, 200), queries(1, 200));
        let q = queries(1, 200);
        let zh = q.iter().filter(|s| s.chars().any(|c| c > '\u{2e80}')).count();
        assert!((30..100).contains(&zh), "{zh}");
        let p = patterns(2, 50);
        assert!(p.iter().all(|w| EN.contains(&w.as_str()) || ZH.contains(&w.as_str())));
    }

    #[test]
    fn writes_the_notes_it_generates() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (n, bytes) = Corpus::new(3, 25).write(dir.path()).expect("write");
        assert_eq!(n, 25);
        let on_disk: u64 =
            Corpus::new(3, 25).map(|n| std::fs::metadata(dir.path().join(&n.path)).expect("file").len()).sum();
        assert_eq!(on_disk, bytes);
    }
}
