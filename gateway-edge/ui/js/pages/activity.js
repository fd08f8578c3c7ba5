// The activity page (placeholder until it is built).
import { h } from '../dom.js';

export function mount(root) {
  root.appendChild(h('h1', null, 'activity'));
  return () => {};
}
